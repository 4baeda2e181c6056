"""The image: the serving Dockerfile, the layered build context (environment, repository,
runtime code, each its own layer), the SDK build and the image's labels."""
