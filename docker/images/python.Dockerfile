# The stand-in for `python:3.11-slim` (see docker/images/build.sh): Debian bookworm's
# Python 3.11 in a virtualenv on PATH, and pip pointed at a wheelhouse built on the host
# (a plain container here cannot verify TLS to the package registries).
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
RUN python3 -m venv /usr/local/python \
    && ln -s /usr/local/python/bin/python /usr/local/bin/python \
    && ln -s /usr/local/python/bin/pip /usr/local/bin/pip
COPY wheels /opt/wheels
COPY pip.conf /etc/pip.conf
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python3"]
