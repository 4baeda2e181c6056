"""What the tests share: the test bed's parts, sample repositories and models, the stand-in
``pb_utils`` and the paths of the tests' data."""
