# sandbox-broker: multi-stage image from Debian packages.
# The build steps live in deploy/image-steps.sh (CI runs them too).
#
#   docker build -t sandbox-broker:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9090:9090 \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     -v $PWD/deploy/configs/local.json:/etc/sandbox-broker/config.json:ro sandbox-broker:0.1.0
#
# The local provider needs unprivileged user namespaces inside the container
# (bubblewrap): hence the relaxed seccomp/AppArmor profiles (see
# deploy/README.md). No extra capabilities, and the broker runs as non-root.

FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN bash deploy/image-steps.sh build /opt/sandbox-broker

FROM debian:bookworm-slim
COPY deploy/image-steps.sh /tmp/image-steps.sh
RUN bash /tmp/image-steps.sh runtime && rm /tmp/image-steps.sh
COPY --from=build /opt/sandbox-broker /opt/sandbox-broker
COPY deploy/configs/local.json /etc/sandbox-broker/config.json
USER 10001
EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/opt/sandbox-broker/bin/sandboxctl", "--addr", "127.0.0.1:50051", "health"]
ENTRYPOINT ["/opt/sandbox-broker/bin/sandbox-brokerd", "--config", "/etc/sandbox-broker/config.json"]
