# sandbox-broker: multi-stage image from Debian packages.
# The build steps live in deploy/image-steps.sh; deploy/README.md explains
# every run option, and deploy/podman-ci.sh (CI) builds and runs this image
# with podman exactly as documented.
#
#   docker build -t sandbox-broker:0.1.0 .
#   docker run -d --name sandbox-broker -p 127.0.0.1:50051:50051 -p 127.0.0.1:9090:9090 \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined sandbox-broker:0.1.0
#   (podman: --security-opt unmask=ALL instead of systempaths=unconfined)
#
# The local provider runs each sandbox in bubblewrap, which needs
# unprivileged user namespaces and a fresh /proc mount inside the
# container: hence the relaxed seccomp/AppArmor profiles and the unmasked
# /proc (see deploy/README.md). No capabilities; the broker runs as
# 10001:10001 and is its own init (a child subreaper that reaps every
# orphan), so no --init is needed.

FROM debian:bookworm AS build
WORKDIR /src
# The packages first: that layer is reused while only the sources change.
COPY deploy/image-steps.sh deploy/image-steps.sh
RUN bash deploy/image-steps.sh build-deps
COPY . .
RUN bash deploy/image-steps.sh build /opt/sandbox-broker

FROM debian:bookworm-slim
COPY deploy/image-steps.sh /tmp/image-steps.sh
RUN bash /tmp/image-steps.sh runtime && rm /tmp/image-steps.sh
COPY --from=build /opt/sandbox-broker /opt/sandbox-broker
# The default config: the local provider, no auth (one tenant, "default";
# logged as a warning at start). Mount your own over it for tokens.
COPY deploy/configs/container.json /etc/sandbox-broker/config.json
USER 10001:10001
EXPOSE 50051 9090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/opt/sandbox-broker/bin/sandboxctl", "--addr", "127.0.0.1:50051", "health"]
ENTRYPOINT ["/opt/sandbox-broker/bin/sandbox-brokerd", "--config", "/etc/sandbox-broker/config.json"]
