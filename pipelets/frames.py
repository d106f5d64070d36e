"""The DataFrame form of a pipelet: what a form touches and the helpers to write one.

``from pipelets.frames import STRING, FrameIO, column, frame_name`` (see
``docs/pipelets.md``, "A DataFrame form").  The engine reads the same names
to plan and run the forms.
"""

from pipelets._frames import (
    DECLINED,
    INT,
    STRING,
    STRINGS,
    FrameIO,
    cached_column,
    column,
    decline,
    frame_name,
    java_regex,
    java_replacement,
    portable,
    top_group,
)

__all__ = ["DECLINED", "INT", "STRING", "STRINGS", "FrameIO", "cached_column", "column",
           "decline", "frame_name", "java_regex", "java_replacement", "portable", "top_group"]
