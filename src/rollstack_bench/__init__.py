"""Benchmarks (`rollstack bench <suite>`), laid out by what each module is:

- `<suite>.py`: one `rollstack bench <suite>` command each (`register(app)`; cli/bench.py);
- `systems/`: the systems compared (rollstack on the bench rig, the containerd baselines);
- `link/`: the shaped network link (netns + tc netem, its probe and relay);
- `micro/`: stage micro-benchmarks run as modules (`python -m rollstack_bench.micro.store`);
- `workload.py`: synthetic bursty workloads in real cgroups; `report.py`: results writers.
"""
