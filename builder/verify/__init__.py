"""Stage 5, verification: a built image run as users run it and compared with the pipeline."""
