"""OpenVINO: compiled graphs for chains, block verification and trees on CPU, GPU and NPU
devices."""
