# A stand-in for python:3.11-slim made from Debian packages (the same Debian release and Python),
# for machines that reach Debian's mirror but no image registry. Only `make test-docker` builds it.
ARG DEBIAN
FROM ${DEBIAN}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && ln -s /usr/bin/python3.11 /usr/local/bin/python3 && ln -s /usr/bin/python3.11 /usr/local/bin/python
ENV LANG=C.UTF-8
CMD ["python3"]
