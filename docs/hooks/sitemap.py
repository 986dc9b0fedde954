"""A hook of the site (mkdocs.yml `hooks`): without `site_url` mkdocs writes a sitemap with
no addresses in it; that file is removed rather than published."""

from pathlib import Path


def on_post_build(config, **kwargs):
    if config.site_url:
        return
    for name in ("sitemap.xml", "sitemap.xml.gz"):
        Path(config.site_dir, name).unlink(missing_ok=True)
