from fslab.cli import main

main()
