from lmprof.scripts import analyze

analyze()
