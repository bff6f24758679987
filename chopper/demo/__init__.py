"""``chopper demo``: an agent plus a real 2-rank PyTorch training job, with a live step table."""
