"""Tag lists."""


def add_tag(tag, tags=[]):
    """A list of tags with tag appended; a new list when none is given."""
    tags.append(tag)
    return tags
