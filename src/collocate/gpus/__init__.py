"""GPU backends behind one interface: NVML for real GPUs, an emulated twin for machines without."""
