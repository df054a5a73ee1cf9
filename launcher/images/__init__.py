"""The image stage: locked requirements, the pinned base, wheels, the content-addressed build,
the image's tree digest and the recipes layer."""
