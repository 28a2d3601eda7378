# The scheduler's image: docker build -t phalanx:0.1.0 .
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir ".[node]" && useradd --uid 65532 --no-create-home phalanx
USER 65532
ENTRYPOINT ["phalanx"]
CMD ["scheduler", "--in-cluster"]
