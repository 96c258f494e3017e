"""hvdk8s's benchmarks (`hvdk8s bench`): hvdk8s against its baselines and peers, as ratios measured
in one run, written as JSON, a Markdown report and plots. Installed as `hvdk8s.bench` so that the
cluster benchmark's ranks find it in the image."""
