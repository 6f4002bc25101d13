"""An engine loads only in the TensorRT that built it, so the build is tied to one release.

The images that build and measure an engine are derived from the serving image's tag; an
image without a release tag, or one that cannot serve, is refused rather than guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.errors import ConfigError

# A pin after the tag (a digest, or the unit's ${RECSYS_TRITON_PIN}) names the same release.
_IMAGE = re.compile(
    r"^(?P<repo>[^\s@:]+(?::\d+)?(?:/[^\s@:]+)*)/tritonserver:"
    r"(?P<release>\d{2}\.\d{2})-py3(?P<flavour>(?:-[a-z0-9]+)*)"
    r"(?:@sha256:[0-9a-f]{64}|\$\{\w+\})?$"
)
_NOT_SERVING = {"-sdk": "the client SDK image", "-min": "the image without backends"}


@dataclass(frozen=True, slots=True)
class ImageRelease:
    """The serving image and the images of the same release that build for and measure it."""

    triton_image: str
    release: str
    tensorrt_image: str
    sdk_image: str


def release_of(image: str) -> ImageRelease:
    """The release (YY.MM) of a tritonserver image, and the same release's TensorRT image."""
    found = _IMAGE.match(image)
    if found is None:
        raise ConfigError(
            f"serving image {image!r} has no release tag (REGISTRY/tritonserver:YY.MM-py3): pin "
            "the tag the service runs (an engine loads only in the TensorRT that built it)"
        )
    repo, release, flavour = found["repo"], found["release"], found["flavour"]
    if not 1 <= int(release.split(".")[1]) <= 12:
        raise ConfigError(f"serving image {image!r}: {release} is not a YY.MM release")
    if flavour in _NOT_SERVING:
        raise ConfigError(
            f"serving image {image!r} is {_NOT_SERVING[flavour]}: give the one Triton serves "
            f"with ({repo}/tritonserver:{release}-py3)"
        )
    return ImageRelease(
        image,
        release,
        f"{repo}/tensorrt:{release}-py3{flavour}",
        f"{repo}/tritonserver:{release}-py3-sdk",
    )
