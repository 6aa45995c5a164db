"""The systems the benchmarks compare: rollstack on the bench rig (`rollstack`), the containerd
baselines (`containerd`, `baselines`: docker-equivalent and dynamic-assembly images, built by
`oci` from the corpus and served by `registry` in its own network namespace), and the rig that
measures them side by side (`rig.BenchRig`)."""
