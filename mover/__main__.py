from mover.cli import main

main()
