# Knowledge Distillation, ported to mirrorkit.
#
# Original: https://keras.io/examples/vision/knowledge_distillation/ (keras-io examples/vision/
# knowledge_distillation.py): a Distiller keras.Model that overrides compute_loss (the student's
# loss and the distillation loss, a keras.losses.KLDivergence of softened teacher and student
# predictions, mixed by alpha) and call (the student's predictions); a Conv2D teacher and
# student, and a copy of the student trained from scratch; the teacher trained and evaluated,
# then distilled into the student, then the student from scratch; each fit and evaluate on
# NumPy arrays.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: mirrorkit's
# bundled 8x8 UCI digits scaled up to 16x16, instead of the MNIST download), so input shape
# (16, 16, 1) and smaller layers (teacher filters 32 and 64, student 4 and 8); 640 training
# images, 160 test images, batch_size 32 instead of 64; 2 epochs for the teacher instead of 5
# and 1 for each student instead of 3; fit(shuffle=False) so that one device and the replicas
# see the same batches.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and each compile (re-indented); the training arrays through mk.distribute.

import numpy as np

LINES_CHANGED = {"added": 60, "removed": 53, "reindented": 50}


def write_data(workdir):
    import os

    from mirrorkit.demo.data import load_digits

    images, labels = load_digits()
    images = np.kron(images[:800], np.ones((2, 2), "uint8")) * 15  # 8x8 in 0..16 -> 16x16
    np.savez(
        os.path.join(workdir, "mnist.npz"),
        x_train=images[:640],
        y_train=labels[:640],
        x_test=images[640:800],
        y_test=labels[640:800],
    )


def original(workdir):
    import os

    import keras
    import numpy as np
    from keras import layers, ops

    class Distiller(keras.Model):
        def __init__(self, student, teacher):
            super().__init__()
            self.teacher = teacher
            self.student = student

        def compile(
            self,
            optimizer,
            metrics,
            student_loss_fn,
            distillation_loss_fn,
            alpha=0.1,
            temperature=3,
        ):
            """Configure the distiller."""
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.alpha = alpha
            self.temperature = temperature

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)

            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1),
            ) * (self.temperature**2)

            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            return loss

        def call(self, x):
            return self.student(x)

    # Create the teacher
    teacher = keras.Sequential(
        [
            keras.Input(shape=(16, 16, 1)),
            layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
            layers.Flatten(),
            layers.Dense(10),
        ],
        name="teacher",
    )

    # Create the student
    student = keras.Sequential(
        [
            keras.Input(shape=(16, 16, 1)),
            layers.Conv2D(4, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),
            layers.Flatten(),
            layers.Dense(10),
        ],
        name="student",
    )

    # Clone student for later comparison
    student_scratch = keras.models.clone_model(student)

    # Prepare the train and test dataset.
    batch_size = 32
    with np.load(os.path.join(workdir, "mnist.npz")) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]

    # Normalize data
    x_train = x_train.astype("float32") / 255.0
    x_train = np.reshape(x_train, (-1, 16, 16, 1))

    x_test = x_test.astype("float32") / 255.0
    x_test = np.reshape(x_test, (-1, 16, 16, 1))

    # Train teacher as usual
    teacher.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )

    # Train and evaluate teacher on data.
    teacher.fit(x_train, y_train, epochs=2, batch_size=batch_size, shuffle=False)
    teacher_eval = teacher.evaluate(x_test, y_test)

    # Initialize and compile distiller
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )

    # Distill teacher to student
    history = distiller.fit(x_train, y_train, epochs=1, batch_size=batch_size, shuffle=False)

    # Evaluate student on test dataset
    distiller_eval = distiller.evaluate(x_test, y_test)

    # Train student as doen usually
    student_scratch.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )

    # Train and evaluate student trained from scratch.
    student_scratch.fit(x_train, y_train, epochs=1, batch_size=batch_size, shuffle=False)
    scratch_eval = student_scratch.evaluate(x_test, y_test)

    from keras_io import outcome

    return outcome(
        distiller,
        history,
        teacher_eval=teacher_eval,
        distiller_eval=distiller_eval,
        scratch_eval=scratch_eval,
        teacher_weights=np.concatenate([w.ravel() for w in teacher.get_weights()]),
        scratch_weights=np.concatenate([w.ravel() for w in student_scratch.get_weights()]),
    )


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    from keras import layers, ops

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    class Distiller(keras.Model):
        def __init__(self, student, teacher):
            super().__init__()
            self.teacher = teacher
            self.student = student

        def compile(
            self,
            optimizer,
            metrics,
            student_loss_fn,
            distillation_loss_fn,
            alpha=0.1,
            temperature=3,
        ):
            """Configure the distiller."""
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.alpha = alpha
            self.temperature = temperature

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)

            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1),
            ) * (self.temperature**2)

            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            return loss

        def call(self, x):
            return self.student(x)

    with strategy.scope():
        # Create the teacher
        teacher = keras.Sequential(
            [
                keras.Input(shape=(16, 16, 1)),
                layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
                layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
                layers.Flatten(),
                layers.Dense(10),
            ],
            name="teacher",
        )

        # Create the student
        student = keras.Sequential(
            [
                keras.Input(shape=(16, 16, 1)),
                layers.Conv2D(4, (3, 3), strides=(2, 2), padding="same"),
                layers.LeakyReLU(negative_slope=0.2),
                layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
                layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),
                layers.Flatten(),
                layers.Dense(10),
            ],
            name="student",
        )

        # Clone student for later comparison
        student_scratch = keras.models.clone_model(student)

    # Prepare the train and test dataset.
    batch_size = 32
    with np.load(os.path.join(workdir, "mnist.npz")) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]

    # Normalize data
    x_train = x_train.astype("float32") / 255.0
    x_train = np.reshape(x_train, (-1, 16, 16, 1))

    x_test = x_test.astype("float32") / 255.0
    x_test = np.reshape(x_test, (-1, 16, 16, 1))

    with strategy.scope():
        # Train teacher as usual
        teacher.compile(
            optimizer=keras.optimizers.Adam(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )

    # Train and evaluate teacher on data.
    train = mk.distribute((x_train, y_train), strategy, global_batch_size=batch_size, shuffle=False)
    teacher.fit(train, epochs=2)
    teacher_eval = teacher.evaluate(x_test, y_test)

    with strategy.scope():
        # Initialize and compile distiller
        distiller = Distiller(student=student, teacher=teacher)
        distiller.compile(
            optimizer=keras.optimizers.Adam(),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            distillation_loss_fn=keras.losses.KLDivergence(),
            alpha=0.1,
            temperature=10,
        )

    # Distill teacher to student
    history = distiller.fit(train, epochs=1)

    # Evaluate student on test dataset
    distiller_eval = distiller.evaluate(x_test, y_test)

    with strategy.scope():
        # Train student as doen usually
        student_scratch.compile(
            optimizer=keras.optimizers.Adam(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )

    # Train and evaluate student trained from scratch.
    student_scratch.fit(train, epochs=1)
    scratch_eval = student_scratch.evaluate(x_test, y_test)

    from keras_io import outcome

    return outcome(
        distiller,
        history,
        teacher_eval=teacher_eval,
        distiller_eval=distiller_eval,
        scratch_eval=scratch_eval,
        teacher_weights=np.concatenate([w.ravel() for w in teacher.get_weights()]),
        scratch_weights=np.concatenate([w.ravel() for w in student_scratch.get_weights()]),
    )
