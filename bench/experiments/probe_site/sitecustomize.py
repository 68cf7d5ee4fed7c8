# On PYTHONPATH, every Python process prints at exit the most torch's allocator reserved (issue 23's probe).
import atexit
import os


def _report():
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            print(f"PROBE rank {os.environ.get('RANK')}: torch max reserved {torch.cuda.max_memory_reserved() >> 20} MiB, "
                  f"max allocated {torch.cuda.max_memory_allocated() >> 20} MiB", flush=True)
    except Exception as error:  # noqa: BLE001
        print("PROBE failed", error, flush=True)


atexit.register(_report)
