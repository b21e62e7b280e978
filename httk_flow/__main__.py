from httk_flow.cli.main import main

main()
