"""The backend's compiler: refuses to compile (TRITON_INTERPRET=1 runs the kernels instead)."""

from triton.backends.compiler import BaseBackend


class StubCPUBackend(BaseBackend):
    @staticmethod
    def supports_target(target):
        return target.backend == "cpu"

    def hash(self):
        return "agentroll-triton-cpu-stub"

    def parse_options(self, options):
        raise NotImplementedError("the stub Triton cpu backend compiles nothing: run with TRITON_INTERPRET=1")

    def add_stages(self, stages, options, language):
        raise NotImplementedError("the stub Triton cpu backend compiles nothing: run with TRITON_INTERPRET=1")

    def load_dialects(self, context):
        pass

    def get_module_map(self):
        return {}
