from lmprof.capture.cli import main

main()
