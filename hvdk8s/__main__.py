from hvdk8s.cli import main

main()
