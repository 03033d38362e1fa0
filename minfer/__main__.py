from minfer.host import signals

signals.install()  # before minfer.cli imports click and the command imports numpy

from minfer.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
