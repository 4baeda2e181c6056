"""Deploying serving images to the orchestrators users run: Docker Swarm stacks
(:mod:`builder.deploy.swarm`) and Kubernetes / KServe manifests (:mod:`builder.deploy.kubernetes`),
both from one description of the image (:mod:`builder.deploy.serving`)."""
