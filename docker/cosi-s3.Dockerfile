# The reference COSI driver as a FROM scratch image (`drivelab driver cosi-s3`),
# for `driver: { image: drivelab-cosi-s3:dev, args: [...] }`. Same static binary
# as docker/Dockerfile; see scripts/build-image.sh.
FROM scratch
COPY drivelab /drivelab
WORKDIR /tmp
ENTRYPOINT ["/drivelab", "driver", "cosi-s3"]
