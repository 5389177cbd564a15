from infracourse.cli import app

app()
