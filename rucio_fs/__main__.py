from rucio_fs.cli.commands import main

main()
