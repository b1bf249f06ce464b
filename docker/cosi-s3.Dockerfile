# The reference COSI driver as a FROM scratch image (`drivelab driver cosi-s3`),
# for `driver: { image: drivelab-cosi-s3:dev, args: [...] }`. The same rootfs
# as docker/Dockerfile; see scripts/build-image.sh.
FROM scratch
COPY rootfs/ /
WORKDIR /tmp
ENTRYPOINT ["/drivelab", "driver", "cosi-s3"]
