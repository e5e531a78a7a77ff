# A stand-in for the prom/prometheus image docker-compose.yml names, from Debian's prometheus (2.42),
# for machines without a registry: same entry point and storage path. Only `make test-docker` builds it.
ARG DEBIAN
FROM ${DEBIAN}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus
WORKDIR /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
