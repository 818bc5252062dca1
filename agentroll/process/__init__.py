"""Small process helpers every part uses: gather-or-cancel, child processes, loading user code, bundled files,
the collector."""
