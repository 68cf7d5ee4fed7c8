"""Tools above the compiler: `tiledsl run` (tools/run.py: emulated ranks in run_program.py, GPUs in
gpu_run.py), the torch reference a run is checked against (reference.py) or an author's expectation
(expect.py), `tiledsl trace` with the host half of the timeline (trace.py), and `tiledsl build --arch`'s
report with its positioned errors (build_arch.py). They import the pipeline;
tiledsl/runtime/, what generated modules import, imports nothing here (tests/test_import_graph.py)."""
