"Shared test settings: one torch thread per process (2 cores shared with JVMs and browsers: more threads oversubscribe)."
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch
torch.set_num_threads(1)
# CPython 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch" when pytest rewrites a
# module late in a session (hypothesis' plugin imports hypothesis at the terminal summary, after the
# ScienceWorld JVM tests); importing it up front keeps that parse at collection time.
import hypothesis  # noqa: E402,F401
