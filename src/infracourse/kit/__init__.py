"""Course components shared by labs and graders: nothing here is downloaded."""
