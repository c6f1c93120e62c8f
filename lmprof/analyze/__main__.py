from lmprof.analyze.cli import main

main()
