"""The backend's driver: the CPU as the one device, target `cpu`."""

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase


class StubCPUDriver(DriverBase):
    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty):
        raise NotImplementedError

    def get_current_target(self):
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def set_current_device(self, device):
        pass

    def get_device_capability(self, device=0):
        return (0, 0)
