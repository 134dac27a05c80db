"""The fixture builder lives in the package (``pcietrace topo --fixture`` uses it too)."""

from pcietrace.collectors.sysfs_fixture import build, config_space  # noqa: F401
