"""Stage 4, the image: the release table, base images, Dockerfile rendering, the layered build
context, the SDK build and the image's labels."""
