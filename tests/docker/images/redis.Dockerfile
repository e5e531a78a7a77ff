# A stand-in for the redis image docker-compose.yml names, from Debian's redis-server (7.0), for
# machines without a registry. Only `make test-docker` builds it.
ARG DEBIAN
FROM ${DEBIAN}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
CMD ["redis-server"]
