"""lmprof: profile a Transformer LM training step and get answers, not screenshots.

Stages (one-way data flow): ``model`` <- ``capture`` -> run directory -> ``analyze`` -> ``reports``.
``analyze`` and ``reports`` never import torch.
"""

__version__ = "0.1.0"
