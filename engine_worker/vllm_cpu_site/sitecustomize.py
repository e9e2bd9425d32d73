"""Runs first in every vLLM process of a CPU worker: command.py puts this folder on PYTHONPATH.

vLLM 0.32's CPU attention and small GEMMs execute Intel AMX tile instructions in the worker
process it spawns, without asking Linux for the AMX state first. Linux grants that state
only to a process that asked (arch_prctl ARCH_REQ_XCOMP_PERM), so on Sapphire Rapids and
later CPUs the worker dies of SIGILL (exit code -4) on its first forward pass. Asking costs
one system call; on a CPU without AMX the call fails and nothing changes.
"""

import ctypes
import platform
import sys

SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if sys.platform == "linux" and platform.machine() == "x86_64":
    ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM,
                                              XFEATURE_XTILEDATA)
