from lmprof.scripts import capture

capture()
