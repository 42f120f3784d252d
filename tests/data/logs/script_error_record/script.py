from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    import yaml_missing_here  # noqa


if __name__ == "__main__":
    main()
