# The recommendation API, and nothing else: the operator's tools (tools/) are not in it.
# Triton runs beside it in its own container (deploy/).
FROM python:3.11-slim AS build
WORKDIR /src
COPY requirements/serve.lock ./
# Every dependency from the lock, its hash checked; then the server's own wheel, built with
# the locked setuptools (no build environment fetched from an index).
RUN pip install --no-cache-dir --require-hashes --no-deps -r serve.lock \
    && pip wheel --no-cache-dir --require-hashes --no-deps --wheel-dir /wheels -r serve.lock
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/recsys recsys
COPY --from=build /wheels /wheels
# Exactly the wheels built above, nothing from an index. The fallback extra (onnxruntime)
# ranks in process while Triton cannot answer; the archive extra (pyarrow) is what
# recsys-archive, run from this image, writes Parquet with.
RUN pip install --no-cache-dir --no-index --find-links /wheels "recsys-serving[fallback,archive]==0.1.0" \
    && rm -rf /wheels
USER 10001
ENV RECSYS_HOST=0.0.0.0 \
    RECSYS_PORT=8080 \
    RECSYS_ARTIFACTS_DIR=/var/lib/recsys/world \
    PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=1)"]
# SIGTERM drains (RECSYS_DRAIN_S, then RECSYS_SHUTDOWN_GRACE_S): stop with a timeout above
# their sum, e.g. `podman stop -t 20`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["recsys-serve"]
