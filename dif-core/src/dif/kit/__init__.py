"""The frontend kit: what every image frontend shares, so a frontend holds model facts only.

`scheduler` reads a diffusers scheduler config into `dif.sched` settings, `sampling` is the one
flow-match Euler + CFG loop, `commands` builds a frontend's `generate` / `info` click commands
from its `dif.frontend.FrontendInfo` (the only module of dif-core that imports click). Import the
modules themselves; this package imports nothing.
"""
