"""What only the tests and the benchmarks use: test doubles, workload generators, example
records, helpers and the shared pytest fixtures. Never installed with the product
(pyproject.toml leaves it out of the packages); `tests/` and `bench/` import it as
`testkit.NAME` because they run from the repository root (`python -m pytest`,
`python -m bench.NAME`).

    fixed_upstream  the fixed-response OpenAI-compatible server (the double for an engine)
    workload        generated rollouts with their expected transitions (streams tests, bench)
    records         realistic example records of every schema (codec tests, bench.codec)
    producers       reading a topic back as decoded records
    streams         producing events to, and reading records back from, a test's topics
    learner         Transition records, producing them, learner settings
    serving         engine settings, a pool of engine processes, real LoRA adapters of the
                    default model, registering them
    metrics         checks of a process's /metrics (names under the scheme) and /state pages
    fixtures/       the shared fixtures (broker, MLflow server, model), loaded through
                    `pytest_plugins` in tests/conftest.py
"""
