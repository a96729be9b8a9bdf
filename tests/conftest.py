import torch

torch.set_num_threads(1)  # tiny models: threads only add contention
