"""A stub Triton backend named `cpu`: present so that a CPU vLLM build sees Triton with a CPU backend and allows
Model Runner V2 (and with it --enable-return-routed-experts). It compiles nothing; kernels must run under
TRITON_INTERPRET=1. See ../README.md. Imported by Triton (in the vLLM venv), never by agentroll or pytest."""
