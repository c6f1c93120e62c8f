"""Capture: the annotated, timed step runner, Nsight Systems and memory capture, CLI ``capture``.

Importing this package does not import torch; ``lmprof.capture.runner`` does.
"""
