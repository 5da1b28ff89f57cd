"Shared test settings: one torch thread per process (2 cores shared with JVMs and browsers: more threads oversubscribe)."
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch
torch.set_num_threads(1)
