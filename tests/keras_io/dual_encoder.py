# Natural language image search with a Dual Encoder, ported to mirrorkit.
#
# Original: https://keras.io/examples/nlp/nl_image_search/ (keras-io
# examples/nlp/nl_image_search.py): a CLIP-style dual encoder. A text encoder (a frozen BERT
# from TensorFlow Hub) and a vision encoder (a frozen Xception) each end in a trainable
# projection head (Dense, gelu, Dense, Dropout, Add, LayerNormalization); a DualEncoder
# keras.Model whose compute_loss scores every caption of the batch against every image
# (logits = caption . image^T / temperature), takes as targets the softmax of the mean of the
# captions' and the images' own similarities, and returns the per-example vector
# (captions_loss + images_loss) / 2 of a crossentropy in both directions; its own train_step
# hands that vector to tape.gradient (which differentiates its sum) and test_step; AdamW;
# fit with validation_data, ReduceLROnPlateau and EarlyStopping on val_loss.
#
# Changed in both functions (not for mirrorkit): stand-in data (`write_data`: 192 pairs of
# 24-value "pooled BERT" and 32-value "pooled Xception" vectors drawn with NumPy, the frozen
# encoders' outputs, instead of the MS-COCO download, the TFRecords and TensorFlow Hub), so
# each encoder is its projection head on such a vector; projection_dims 16 instead of 256;
# dropout_rate 0 (each replica draws its own dropout); SGD(0.0003) instead of AdamW (Adam's
# update does not change with the gradient's scale, which hides a gradient 1/N of one
# device's); batch_size 32 instead of 256, 3 epochs, verbose=0, no shuffle; the encoders
# are passed to the model instead of read from module globals; keras.ops.gelu instead of
# tf.nn.gelu on the functional model's tensors (Keras 3); no search section.
#
# Changed for mirrorkit (`ported` against `original`, LINES_CHANGED, counted by difflib):
# import mirrorkit; strategy = mk.strategy(...); `with strategy.scope():` around the models'
# construction and compile (re-indented); both data sets through mk.distribute; in
# compute_loss, every replica's captions and images gathered (mk.all_gather) and this
# replica's rows (mk.all_gather_offset) taken from the targets and, for the images' direction,
# the logits of this replica's images against every caption: each replica computes one
# device's per-example losses of its own examples. The loss stays a per-example vector, as
# the example writes it: one device's gradient is that of its sum, which mirrorkit reads
# from the traced step (docs: own-train-step/).

import numpy as np

LINES_CHANGED = {"added": 21, "removed": 14, "reindented": 4}
PAIRS = 192


def write_data(workdir):
    import os

    rng = np.random.default_rng(0)
    topics = rng.normal(size=(8, 12))  # captions and images of one topic look alike
    topic = rng.integers(0, 8, PAIRS)
    text = topics[topic] @ rng.normal(size=(12, 24)) + 0.3 * rng.normal(size=(PAIRS, 24))
    image = topics[topic] @ rng.normal(size=(12, 32)) + 0.3 * rng.normal(size=(PAIRS, 32))
    np.savez(os.path.join(workdir, "pairs.npz"), text=text, image=image)


def original(workdir):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    with np.load(os.path.join(workdir, "pairs.npz")) as f:
        text, image = f["text"].astype("float32"), f["image"].astype("float32")
    train = {"caption": text[:128], "image": image[:128]}
    valid = {"caption": text[128:], "image": image[128:]}

    def project_embeddings(embeddings, num_projection_layers, projection_dims, dropout_rate):
        projected_embeddings = layers.Dense(units=projection_dims)(embeddings)
        for _ in range(num_projection_layers):
            x = keras.ops.gelu(projected_embeddings)
            x = layers.Dense(projection_dims)(x)
            x = layers.Dropout(dropout_rate)(x)
            x = layers.Add()([projected_embeddings, x])
            projected_embeddings = layers.LayerNormalization()(x)
        return projected_embeddings

    def create_encoder(size, name, num_projection_layers, projection_dims, dropout_rate):
        inputs = layers.Input(shape=(size,), name=f"{name}_input")
        outputs = project_embeddings(inputs, num_projection_layers, projection_dims, dropout_rate)
        return keras.Model(inputs, outputs, name=f"{name}_encoder")

    class DualEncoder(keras.Model):
        def __init__(self, text_encoder, image_encoder, temperature=1.0, **kwargs):
            super().__init__(**kwargs)
            self.text_encoder = text_encoder
            self.image_encoder = image_encoder
            self.temperature = temperature
            self.loss_tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, features, training=False):
            caption_embeddings = self.text_encoder(features["caption"], training=training)
            image_embeddings = self.image_encoder(features["image"], training=training)
            return caption_embeddings, image_embeddings

        def compute_loss(self, caption_embeddings, image_embeddings):
            logits = (
                tf.matmul(caption_embeddings, image_embeddings, transpose_b=True) / self.temperature
            )
            images_similarity = tf.matmul(image_embeddings, image_embeddings, transpose_b=True)
            captions_similarity = tf.matmul(
                caption_embeddings, caption_embeddings, transpose_b=True
            )
            targets = keras.activations.softmax(
                (captions_similarity + images_similarity) / (2 * self.temperature)
            )
            captions_loss = keras.losses.categorical_crossentropy(
                y_true=targets, y_pred=logits, from_logits=True
            )
            images_loss = keras.losses.categorical_crossentropy(
                y_true=tf.transpose(targets), y_pred=tf.transpose(logits), from_logits=True
            )
            return (captions_loss + images_loss) / 2

        def train_step(self, features):
            with tf.GradientTape() as tape:
                caption_embeddings, image_embeddings = self(features, training=True)
                loss = self.compute_loss(caption_embeddings, image_embeddings)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def test_step(self, features):
            caption_embeddings, image_embeddings = self(features, training=False)
            loss = self.compute_loss(caption_embeddings, image_embeddings)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    num_epochs = 3
    batch_size = 32

    vision_encoder = create_encoder(32, "vision", 1, 16, 0.0)
    text_encoder = create_encoder(24, "text", 1, 16, 0.0)
    dual_encoder = DualEncoder(text_encoder, vision_encoder, temperature=0.05)
    dual_encoder.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0003))

    train_dataset = tf.data.Dataset.from_tensor_slices(train).batch(batch_size)
    valid_dataset = tf.data.Dataset.from_tensor_slices(valid).batch(batch_size)
    reduce_lr = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.2, patience=3)
    early_stopping = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=5, restore_best_weights=True
    )
    history = dual_encoder.fit(
        train_dataset,
        epochs=num_epochs,
        validation_data=valid_dataset,
        callbacks=[reduce_lr, early_stopping],
        verbose=0,
    )

    from keras_io import outcome

    return outcome(dual_encoder, history)


def ported(workdir, cpu_replicas):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    from keras import layers

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=cpu_replicas)

    with np.load(os.path.join(workdir, "pairs.npz")) as f:
        text, image = f["text"].astype("float32"), f["image"].astype("float32")
    train = {"caption": text[:128], "image": image[:128]}
    valid = {"caption": text[128:], "image": image[128:]}

    def project_embeddings(embeddings, num_projection_layers, projection_dims, dropout_rate):
        projected_embeddings = layers.Dense(units=projection_dims)(embeddings)
        for _ in range(num_projection_layers):
            x = keras.ops.gelu(projected_embeddings)
            x = layers.Dense(projection_dims)(x)
            x = layers.Dropout(dropout_rate)(x)
            x = layers.Add()([projected_embeddings, x])
            projected_embeddings = layers.LayerNormalization()(x)
        return projected_embeddings

    def create_encoder(size, name, num_projection_layers, projection_dims, dropout_rate):
        inputs = layers.Input(shape=(size,), name=f"{name}_input")
        outputs = project_embeddings(inputs, num_projection_layers, projection_dims, dropout_rate)
        return keras.Model(inputs, outputs, name=f"{name}_encoder")

    class DualEncoder(keras.Model):
        def __init__(self, text_encoder, image_encoder, temperature=1.0, **kwargs):
            super().__init__(**kwargs)
            self.text_encoder = text_encoder
            self.image_encoder = image_encoder
            self.temperature = temperature
            self.loss_tracker = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.loss_tracker]

        def call(self, features, training=False):
            caption_embeddings = self.text_encoder(features["caption"], training=training)
            image_embeddings = self.image_encoder(features["image"], training=training)
            return caption_embeddings, image_embeddings

        def compute_loss(self, caption_embeddings, image_embeddings):
            all_captions = mk.all_gather(caption_embeddings)
            all_images = mk.all_gather(image_embeddings)
            mine = mk.all_gather_offset(caption_embeddings) + tf.range(
                tf.shape(caption_embeddings)[0]
            )
            logits = tf.matmul(caption_embeddings, all_images, transpose_b=True) / self.temperature
            images_similarity = tf.matmul(all_images, all_images, transpose_b=True)
            captions_similarity = tf.matmul(all_captions, all_captions, transpose_b=True)
            targets = keras.activations.softmax(
                (captions_similarity + images_similarity) / (2 * self.temperature)
            )
            captions_loss = keras.losses.categorical_crossentropy(
                y_true=tf.gather(targets, mine), y_pred=logits, from_logits=True
            )
            image_logits = tf.matmul(image_embeddings, all_captions, transpose_b=True)
            images_loss = keras.losses.categorical_crossentropy(
                y_true=tf.gather(tf.transpose(targets), mine),
                y_pred=image_logits / self.temperature,
                from_logits=True,
            )
            return (captions_loss + images_loss) / 2

        def train_step(self, features):
            with tf.GradientTape() as tape:
                caption_embeddings, image_embeddings = self(features, training=True)
                loss = self.compute_loss(caption_embeddings, image_embeddings)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def test_step(self, features):
            caption_embeddings, image_embeddings = self(features, training=False)
            loss = self.compute_loss(caption_embeddings, image_embeddings)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    num_epochs = 3
    batch_size = 32

    with strategy.scope():
        vision_encoder = create_encoder(32, "vision", 1, 16, 0.0)
        text_encoder = create_encoder(24, "text", 1, 16, 0.0)
        dual_encoder = DualEncoder(text_encoder, vision_encoder, temperature=0.05)
        dual_encoder.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0003))

    train_dataset = mk.distribute(train, strategy, global_batch_size=batch_size, shuffle=False)
    valid_dataset = mk.distribute(valid, strategy, global_batch_size=batch_size, for_eval=True)
    reduce_lr = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.2, patience=3)
    early_stopping = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=5, restore_best_weights=True
    )
    history = dual_encoder.fit(
        train_dataset,
        epochs=num_epochs,
        validation_data=valid_dataset,
        callbacks=[reduce_lr, early_stopping],
        verbose=0,
    )

    from keras_io import outcome

    return outcome(dual_encoder, history)
