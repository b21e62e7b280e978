"""Chaos tests: many managers and attempts SIGKILLed at random moments, then audited."""
